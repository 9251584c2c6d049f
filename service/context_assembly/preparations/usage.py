"""A provider's usage report recorded against its preparation (docs/contract.md, "Lifecycle"):
normalised, compared with the estimate and with the turn's cache plan, priced, kept once per
``report_id``, and the ratio it observes for the estimate's calibration. ``RecordedUsage`` is
what the operation answers (``operations.Preparations.usage``; ``tracing`` reads it for the
span)."""

from __future__ import annotations

from dataclasses import dataclass

from context_assembly.core import calibration
from context_assembly.core.usage import accounting_observation, normalize_usage
from context_assembly.engine import rfc3339
from context_assembly.errors import InvalidError
from context_assembly.lifecycle_models import AccountingReport, UsageRequest, UsageResponse
from context_assembly.preparations import turns
from context_assembly.preparations.clock import Clock
from context_assembly.preparations.costs import report_cost
from context_assembly.preparations.record import StoredPreparation, not_found
from context_assembly.storage import Accounting, PreparationRecord, Slot, Store
from context_assembly.tokens.prices import ModelPrices


@dataclass(frozen=True, slots=True)
class RecordedUsage:
    """What ``usage`` answers, and whether this call applied the report (``False``: a repeat)."""

    response: UsageResponse
    applied: bool


async def record_usage(
    store: Store,
    tenant: str,
    prep_id: str,
    record: PreparationRecord,
    stored: StoredPreparation,
    body: UsageRequest,
    *,
    prices: ModelPrices,
    clock: Clock,
    max_reports: int,
) -> RecordedUsage:
    """Record one provider usage report on the live ``record``; the same ``report_id`` twice
    changes nothing.

    A ``report_id`` the record already holds is answered from it before the body is read
    again, so a repeat answers the same whatever it carries. A new one over ``max_reports``
    (``limits.max_usage_reports``) for this preparation is refused (422): the reports are kept
    for idempotency and every lifecycle call reads them.
    """
    seen = record.reports.get(body.report_id)
    if seen is not None:
        return RecordedUsage(_usage_response(prep_id, stored, seen), applied=False)
    normalized = normalize_usage(body.provider, body.usage)
    estimate = stored.estimated_input_tokens
    if body.call == "repair" and stored.repair_estimated_input_tokens is not None:
        estimate = stored.repair_estimated_input_tokens
    missed = turns.NO_TURN
    if body.call == "main":
        read, total = normalized.cached_input_tokens, normalized.provider_input_tokens
        unread = None if total is None else total - (read or 0)
        missed = turns.rebilled(stored.cache, read, unread)
    observation = accounting_observation(
        normalized,
        estimate,
        body.provider,
        body.call,
        body.report_id,
        rfc3339(clock.now()),
        expected_cached_tokens=None if body.call == "repair" else turns.expected_of(stored),
        response_id=body.response_id,
        diagnostics=body.diagnostics,
        cost=report_cost(
            prices,
            stored.model,
            body.provider,
            body.usage,
            normalized,
            _ttl(stored),
            rebilled_tokens=missed.tokens,
        ),
        miss_cause=missed.cause,
        rebilled_tokens=missed.tokens,
    )
    slot: Slot = "auxiliary" if body.call == "repair" else "last"
    result = await store.record_usage(
        tenant, prep_id, body.report_id, slot, observation, clock.wall(), max_reports=max_reports
    )
    if result.status == "full":
        raise InvalidError(
            f"preparation {prep_id} already holds {max_reports} usage reports"
            " (limits.max_usage_reports)",
            max_usage_reports=max_reports,
        )
    if result.status == "missing" or result.accounting is None:
        raise not_found(prep_id)
    if result.status == "applied" and body.call == "main":
        await _calibrate(store, tenant, stored, normalized.provider_input_tokens)
    return RecordedUsage(
        _usage_response(prep_id, stored, result.accounting),
        applied=result.status == "applied",
    )


async def _calibrate(
    store: Store, tenant: str, stored: StoredPreparation, provider_input: int | None
) -> None:
    """Keep the ratio a main call's report observes on a wholly estimated count
    (``core/calibration.py``), under the model's registry entry. An anchored count is not
    observed: the provider's figure it anchored on also holds the previous turn's own
    messages, so its estimated rest cannot be told apart exactly."""
    budget = stored.response.budget
    if budget.count_source not in ("estimate", "calibrated"):
        return
    ratio = calibration.observed_ratio(
        provider_input, budget.estimated_tokens, budget.calibration_factor
    )
    if ratio is not None:
        model = stored.response.selection.model_entry or stored.model
        await store.calibration(tenant, model, ratio)


def _ttl(stored: StoredPreparation) -> str:
    """The time to live the preparation's cache plan asked for (``5m`` unless it said ``1h``)."""
    options = None if stored.cache is None else stored.cache.options
    return "1h" if options is not None and options.ttl == "1h" else "5m"


def accounting_report(stored: StoredPreparation, accounting: Accounting) -> AccountingReport:
    """The accounting as the views show it: the estimate beside the kept reports."""
    return AccountingReport.model_validate(
        {"estimated_input_tokens": stored.estimated_input_tokens, **accounting.as_dict()}
    )


def _usage_response(
    prep_id: str, stored: StoredPreparation, accounting: Accounting
) -> UsageResponse:
    return UsageResponse(preparation_id=prep_id, accounting=accounting_report(stored, accounting))
