"""Wire models of the lifecycle calls (SPEC §3.3): validate, refresh, repair, usage, and reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictStr

from context_assembly.core.frame import Frame
from context_assembly.core.request import Frozen, JsonObject, Scope
from context_assembly.core.result import BudgetReport, FirstChange, SelectionReport
from context_assembly.core.usage import CallKind, Provider


class ValidateRequest(Frozen):
    model: StrictStr = Field(min_length=1)
    scope: Scope = Field(default_factory=Scope)
    frame: Frame


class ValidateResponse(Frozen):
    valid: Literal[True] = True
    preparation_id: str
    checked_at: str


class RepairRequest(Frozen):
    model: StrictStr = Field(min_length=1)
    scope: Scope = Field(default_factory=Scope)
    instructions: StrictStr = ""
    frame: Frame
    answer: StrictStr
    schema_: JsonObject | None = Field(default=None, alias="schema")


class RepairResponse(Frozen):
    preparation_id: str
    frame: dict[str, Any]
    estimated_input_tokens: int


class UsageRequest(Frozen):
    report_id: StrictStr = Field(min_length=1, max_length=256)
    provider: Provider
    call: CallKind = "main"
    usage: JsonObject


class Observation(Frozen):
    provider: Provider
    call: CallKind
    report_id: str
    observed_at: str
    provider_input_tokens: int | None
    input_token_delta: int | None
    cached_input_tokens: int | None
    # The cached input tokens the preparation's cache plan expects for this call (``None``: a
    # repair call, or a report stored before the figure existed).
    expected_cached_tokens: int | None = None
    cache_creation_input_tokens: int | None
    output_tokens: int | None


class AccountingReport(Frozen):
    estimated_input_tokens: int
    last: Observation | None
    auxiliary: Observation | None


class UsageResponse(Frozen):
    preparation_id: str
    accounting: AccountingReport


class PreparationView(Frozen):
    """``GET /v1/preparations/{id}``: everything stored, never block bodies."""

    preparation_id: str
    model: str
    layout: Literal["legacy", "stable-prefix"]
    render: str
    budget: BudgetReport
    selection: SelectionReport
    fingerprint: str
    prefix_hash: str
    prefix_tokens: int
    input_hash: str
    expires_at: str
    attempt: int
    refresh_used: bool
    accounting: AccountingReport


class BudgetResponse(Frozen):
    """``POST /v1/budget``: what is already materialisable, no contributor called."""

    model: str
    budget: BudgetReport
    selection: SelectionReport
    pending_sources: list[str]


class TimelineTurn(Frozen):
    """One preparation of a timeline: its figures and how its prefix compared with the one
    before (``prefix_kept``/``first_change`` as in ``selection.cache``)."""

    preparation_id: str
    created_at: str | None
    model: str
    render: str
    layout: str
    total_input_tokens: int
    previous_preparation_id: str | None
    prefix_kept: bool | None
    first_change: FirstChange | None
    cacheable_tokens: int | None
    expected_cached_tokens: int | None
    cached_input_tokens: int | None


class Timeline(Frozen):
    """``GET /v1/preparations/{id}/timeline``: the preparation and those before it in the same
    scope, oldest first (at most 50, the newest)."""

    preparation_id: str
    turns: list[TimelineTurn]
