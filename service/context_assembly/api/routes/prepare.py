"""``POST /v1/prepare`` and ``POST /v1/budget``: a model call prepared (contributors called, the
record stored), or only counted and selected. A prepare's answer is its prepared JSON, and its
metrics are observed once it is sent (:func:`prepared_answer`; a refresh answers the same way).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from context_assembly.api.middleware import PREPARATION_ID
from context_assembly.api.routes.dependencies import (
    LargeBody,
    MetricsDep,
    PrepareBody,
    Service,
    Tenant,
)
from context_assembly.api.routes.examples import PREPARE_EXAMPLES, with_examples
from context_assembly.api.routes.problem_answers import ASSEMBLY_422, COMMON, problems
from context_assembly.api.routes.responses import json_response
from context_assembly.core.request import PrepareRequest
from context_assembly.core.result import PrepareResponse
from context_assembly.errors import ServiceError
from context_assembly.lifecycle_models import BudgetResponse
from context_assembly.metrics import Metrics
from context_assembly.preparations import Prepared


def prepared_answer(
    prepared: Prepared, metrics: Metrics, operation: str, seconds: float, body: PrepareRequest
) -> Response:
    """The prepared JSON as the answer; its metrics are observed once the answer is sent."""

    async def observe() -> None:
        metrics.observe_preparation(
            operation, seconds, prepared.response, prepared.decisions, body.contributors
        )

    return Response(
        prepared.body, media_type="application/json", background=BackgroundTask(observe)
    )


def observe_failure(
    err: Exception, metrics: Metrics, operation: str, seconds: float, body: PrepareRequest
) -> None:
    """A prepare or refresh that failed is counted too: its latency under its status, and the
    contributor calls that had settled (a 502 or 504 carries them)."""
    status = err.status if isinstance(err, ServiceError) else 500
    calls = err.calls if isinstance(err, ServiceError) else ()
    metrics.observe_failure(operation, seconds, status, calls, body.contributors)


router = APIRouter(prefix="/v1")


@router.post(
    "/prepare",
    response_model=PrepareResponse,
    responses=problems(*COMMON, 502, 504, s422=ASSEMBLY_422),
    name="prepare",
    tags=["Prepare"],
    summary="Prepare a model call",
    response_description="The frame to send, the budget, the manifest (`selection`) and the "
    "hashes; the preparation is stored under `preparation_id`.",
    openapi_extra=with_examples(PrepareRequest, PREPARE_EXAMPLES),
)
async def prepare(
    tenant: Tenant,
    body: PrepareBody,
    large: LargeBody,
    service: Service,
    metrics: MetricsDep,
    request: Request,
) -> Response:
    """The service calls the contributors in parallel under one deadline
    (`assembly.timeout_ms`), validates every block, counts it with the model's tokenizer,
    selects what fits (protected blocks and their dependencies first, then by priority, with a
    projection when the full text does not fit), lays the frame out and stores a record.
    Every block gets a status (`selected`, `projected`, `omitted`) and a reason."""
    started = time.perf_counter()
    try:
        prepared = await service.prepare(tenant, body, large_body=large)
    except Exception as err:
        observe_failure(err, metrics, "prepare", time.perf_counter() - started, body)
        raise
    request.scope[PREPARATION_ID] = prepared.response.preparation_id  # for the access line
    return prepared_answer(prepared, metrics, "prepare", time.perf_counter() - started, body)


@router.post(
    "/budget",
    response_model=BudgetResponse,
    responses=problems(*COMMON, s422=ASSEMBLY_422),
    name="budget",
    tags=["Prepare"],
    summary="Count and select without calling anyone",
    response_description="The budget and manifest of what is materialisable, and the webhook "
    "sources left pending.",
    openapi_extra=with_examples(PrepareRequest, PREPARE_EXAMPLES),
)
async def budget(tenant: Tenant, body: PrepareBody, large: LargeBody, service: Service) -> Response:
    """The same body as prepare, but only what is already materialisable (inline
    contributions, the whiteboard, legacy views) is counted and selected: no contributor is
    called and nothing is stored."""
    return json_response(await service.budget(tenant, body, large_body=large))
