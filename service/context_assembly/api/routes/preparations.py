"""``/v1/preparations/{preparation_id}``: a stored preparation read, checked before dispatch
(validate), prepared again (refresh), framed for a repair, told the provider's usage, and shown
to people (the breakdown and the timeline pages)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from context_assembly.api.breakdown_html import render_html
from context_assembly.api.breakdown_text import render_text
from context_assembly.api.routes.dependencies import (
    LargeBody,
    MetricsDep,
    PrepareBody,
    RepairBody,
    Service,
    Tenant,
    UsageBody,
    ValidateBody,
)
from context_assembly.api.routes.examples import (
    PREPARE_EXAMPLES,
    REPAIR_EXAMPLES,
    USAGE_EXAMPLES,
    VALIDATE_EXAMPLES,
    with_examples,
)
from context_assembly.api.routes.prepare import observe_failure, prepared_answer
from context_assembly.api.routes.problem_answers import (
    ASSEMBLY_422,
    COMMON,
    PARAMETER_422,
    problems,
)
from context_assembly.api.routes.responses import (
    PAGE_HEADERS,
    json_response,
    wants_html,
    wants_json,
)
from context_assembly.api.timeline import render_html as timeline_html
from context_assembly.api.timeline import render_text as timeline_text
from context_assembly.core.request import PrepareRequest
from context_assembly.core.result import PrepareResponse
from context_assembly.lifecycle_models import (
    PreparationView,
    RepairRequest,
    RepairResponse,
    Timeline,
    UsageRequest,
    UsageResponse,
    ValidateRequest,
    ValidateResponse,
)

router = APIRouter(prefix="/v1")


@router.get(
    "/preparations/{preparation_id}",
    response_model=PreparationView,
    responses=problems(401, 404, 422, 503, s422=PARAMETER_422),
    name="get_preparation",
    tags=["Views"],
    summary="Read a preparation",
    response_description="The stored record: manifest, budget, hashes, expiry, attempt and the "
    "usage accounting.",
)
async def get_preparation(preparation_id: str, tenant: Tenant, service: Service) -> Response:
    """Everything stored about one preparation. Never block texts, instructions, history or
    input: the record does not hold them."""
    return json_response(await service.get(tenant, preparation_id))


@router.post(
    "/preparations/{preparation_id}/validate",
    response_model=ValidateResponse,
    responses=problems(
        *COMMON,
        404,
        409,
        s409="`CONTEXT_ASSEMBLY_STALE`: `reasons` lists why, such as `model_changed`, "
        "`scope_changed`, `prefix_changed`, `input_changed`, `expired:<source>/<id>`, "
        "`revision_changed:<source>` or `revision_unavailable:<source>`: prepare again.",
    ),
    name="validate_preparation",
    tags=["Lifecycle"],
    summary="Check a preparation right before dispatch",
    response_description="The preparation holds: send the frame.",
    openapi_extra=with_examples(ValidateRequest, VALIDATE_EXAMPLES),
)
async def validate(
    preparation_id: str, tenant: Tenant, body: ValidateBody, service: Service
) -> Response:
    """The final check right before dispatch, with the `model` and the `frame` about to be sent
    (and optionally the `scope`): the prefix, the input and the expiry of the entered blocks
    are compared with the record, and each contributor is asked for its current revision."""
    return json_response(await service.validate(tenant, preparation_id, body))


@router.post(
    "/preparations/{preparation_id}/refresh",
    response_model=PrepareResponse,
    responses=problems(
        *COMMON,
        404,
        409,
        502,
        504,
        s409="`CONTEXT_ASSEMBLY_STALE`: the trusted prefix changed, or the one refresh is used "
        "(`refresh_used`); `reasons` lists why.",
        s422=ASSEMBLY_422,
    ),
    name="refresh_preparation",
    tags=["Lifecycle"],
    summary="Prepare again after the host edited the turn",
    response_description="A new frame for the same preparation (`attempt: 2`).",
    openapi_extra=with_examples(PrepareRequest, PREPARE_EXAMPLES),
)
async def refresh(
    preparation_id: str,
    tenant: Tenant,
    body: PrepareBody,
    large: LargeBody,
    service: Service,
    metrics: MetricsDep,
) -> Response:
    """After the host's hooks edited the history or the current input: the whole edited prepare
    request again. The trusted prefix (model, scope, instructions, plugins, tools, options,
    inline sources, the original history) must be unchanged; contributors are called once more
    within what is left of the deadline. Allowed once."""
    started = time.perf_counter()
    try:
        prepared = await service.refresh(tenant, preparation_id, body, large_body=large)
    except Exception as err:
        observe_failure(err, metrics, "refresh", time.perf_counter() - started, body)
        raise
    return prepared_answer(prepared, metrics, "refresh", time.perf_counter() - started, body)


@router.post(
    "/preparations/{preparation_id}/repair",
    response_model=RepairResponse,
    responses=problems(*COMMON, 404, 409),
    name="repair_preparation",
    tags=["Lifecycle"],
    summary="Frame a structured-output repair call",
    response_description="The repair call's frame and its estimated input tokens.",
    openapi_extra=with_examples(RepairRequest, REPAIR_EXAMPLES),
)
async def repair(
    preparation_id: str, tenant: Tenant, body: RepairBody, service: Service
) -> Response:
    """A frame for a repair call after the model answered: the dispatched frame, the answer and
    a user message asking for the answer as JSON (matching `schema` if given). It checks
    staleness like validate and calls no contributor."""
    return json_response(await service.repair(tenant, preparation_id, body))


@router.post(
    "/preparations/{preparation_id}/usage",
    response_model=UsageResponse,
    responses=problems(*COMMON, 404),
    name="report_usage",
    tags=["Lifecycle"],
    summary="Report the provider's usage",
    response_description="The accounting: the estimate beside the normalised reports.",
    openapi_extra=with_examples(UsageRequest, USAGE_EXAMPLES),
)
async def usage(
    preparation_id: str, tenant: Tenant, body: UsageBody, service: Service, metrics: MetricsDep
) -> Response:
    """The provider's usage object for a call made with this preparation. The service
    normalises it (input, cached, cache-creation and output tokens) and keeps the difference
    from its estimate. The same `report_id` twice changes nothing; an expired preparation is
    never recreated."""
    recorded = await service.usage(tenant, preparation_id, body)
    accounting = recorded.response.accounting
    observed = accounting.auxiliary if body.call == "repair" else accounting.last
    # A repeated report_id is observed once, by its first call.
    if recorded.applied and observed is not None and observed.report_id == body.report_id:
        metrics.observe_usage(tenant, observed)
        if body.call != "repair" and observed.input_token_delta is not None:
            metrics.usage_delta.labels(body.provider).observe(observed.input_token_delta)
    return json_response(recorded.response)


@router.get(
    "/preparations/{preparation_id}/breakdown",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/html": {}, "text/plain": {}}},
        **problems(401, 404, 422, 503, s422=PARAMETER_422),
    },
    name="get_breakdown",
    tags=["Views"],
    summary="The breakdown of a preparation",
    response_description="HTML when `Accept` prefers `text/html` (a browser), plain text "
    "otherwise.",
)
async def breakdown(
    preparation_id: str, request: Request, tenant: Tenant, service: Service
) -> Response:
    """Human view: budget bars, decisions with reasons, accounting. HTML for browsers, else text."""
    shown = await service.breakdown(tenant, preparation_id)
    vary = {"vary": "Accept"}
    if wants_html(request.headers.get("accept", "")):
        return HTMLResponse(render_html(shown), headers={**vary, **PAGE_HEADERS})
    return PlainTextResponse(render_text(shown), headers=vary)


@router.get(
    "/preparations/{preparation_id}/timeline",
    response_model=Timeline,
    responses={
        200: {"content": {"text/html": {}, "text/plain": {}}},
        **problems(401, 404, 422, 503, s422=PARAMETER_422),
    },
    name="get_timeline",
    tags=["Views"],
    summary="The timeline of a conversation",
    response_description="JSON with `Accept: application/json`, an HTML page with a chart for "
    "a browser, plain text otherwise.",
)
async def timeline(
    preparation_id: str,
    request: Request,
    tenant: Tenant,
    service: Service,
    before: Annotated[
        int | None,
        Query(
            ge=1,
            le=2**31 - 1,
            description="Show the turns numbered below this one (the older_before of a page); "
            "absent: the newest turns.",
        ),
    ] = None,
) -> Response:
    """A page of the preparation's conversation (up to 50 turns, oldest first): total input,
    prefix kept, first change by name, expected and reported cached tokens and misses per turn.
    JSON with ``Accept: application/json``, HTML for browsers (with an SVG chart), else text."""
    view = await service.timeline(tenant, preparation_id, before)
    vary = {"vary": "Accept"}
    accept = request.headers.get("accept", "")
    if wants_json(accept):
        response = json_response(view)
        response.headers.update(vary)
        return response
    if wants_html(accept):
        return HTMLResponse(timeline_html(view, before), headers={**vary, **PAGE_HEADERS})
    return PlainTextResponse(timeline_text(view, before), headers=vary)
