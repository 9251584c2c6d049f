"""Thin, typed routes: parse → call ``Preparations`` → return a response model."""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.background import BackgroundTask

from context_assembly.api.auth import Authenticator
from context_assembly.api.bodies import documented, json_body
from context_assembly.api.breakdown import render_html, render_text
from context_assembly.api.middleware import PREPARATION_ID
from context_assembly.api.problems import PROBLEM_JSON, problem_response
from context_assembly.api.reload import reload_settings
from context_assembly.api.timeline import render_html as timeline_html
from context_assembly.api.timeline import render_text as timeline_text
from context_assembly.config import Settings
from context_assembly.core.request import PrepareRequest
from context_assembly.core.result import PrepareResponse
from context_assembly.errors import (
    InvalidError,
    NotFoundError,
    ServiceError,
    StoreUnavailableError,
    UnauthenticatedError,
)
from context_assembly.lifecycle import (
    BudgetResponse,
    PreparationView,
    RepairRequest,
    RepairResponse,
    Timeline,
    UsageRequest,
    UsageResponse,
    ValidateRequest,
    ValidateResponse,
)
from context_assembly.metrics import Metrics
from context_assembly.preparations import Preparations, Prepared
from context_assembly.tokens.registry import ModelRegistry


class Problem(BaseModel):
    """An RFC 9457 problem; ``code`` is one of the service's error codes."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        status: {
            "model": Problem,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


def json_response(model: BaseModel) -> Response:
    """The answer of a response model, serialised once, in pydantic-core.

    Returning the model would make FastAPI dump it to Python objects, validate those against the
    response model again and serialise them. The route keeps ``response_model`` for the OpenAPI
    document; the values are built by the core and the models are already validated.
    """
    return Response(model.model_dump_json(), media_type="application/json")


def _answer(
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


def _failed(
    err: Exception, metrics: Metrics, operation: str, seconds: float, body: PrepareRequest
) -> None:
    """A prepare or refresh that failed is counted too: its latency under its status, and the
    contributor calls that had settled (a 502 or 504 carries them)."""
    status = err.status if isinstance(err, ServiceError) else 500
    calls = err.calls if isinstance(err, ServiceError) else ()
    metrics.observe_failure(operation, seconds, status, calls, body.contributors)


async def get_tenant(request: Request) -> str:
    auth: Authenticator = request.app.state.auth
    return auth.tenant(request)


async def get_preparations(request: Request) -> Preparations:
    service: Preparations = request.app.state.preparations
    return service


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


# Dependencies are async: a sync one would cost a thread-pool hop on every request. A route
# names the tenant first, so a missing key is 401 before any problem with the body.
Tenant = Annotated[str, Depends(get_tenant)]
Service = Annotated[Preparations, Depends(get_preparations)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
PrepareBody = Annotated[PrepareRequest, Depends(json_body(PrepareRequest))]
ValidateBody = Annotated[ValidateRequest, Depends(json_body(ValidateRequest))]
RepairBody = Annotated[RepairRequest, Depends(json_body(RepairRequest))]
UsageBody = Annotated[UsageRequest, Depends(json_body(UsageRequest))]
# The body models, in the order the routes take them (``app._complete_openapi`` documents them).
BODY_MODELS = (PrepareRequest, ValidateRequest, RepairRequest, UsageRequest)

v1 = APIRouter(prefix="/v1")
ops = APIRouter()
COMMON = (401, 413, 422, 503)


@v1.post(
    "/prepare",
    response_model=PrepareResponse,
    responses=_problems(*COMMON, 502, 504),
    name="prepare",
    openapi_extra=documented(PrepareRequest),
)
async def prepare(
    tenant: Tenant, body: PrepareBody, service: Service, metrics: MetricsDep, request: Request
) -> Response:
    """Run contributors, select under the budget, lay out; answer frame, manifest, budget, hashes."""
    started = time.perf_counter()
    try:
        prepared = await service.prepare(tenant, body)
    except Exception as err:
        _failed(err, metrics, "prepare", time.perf_counter() - started, body)
        raise
    request.scope[PREPARATION_ID] = prepared.response.preparation_id  # for the access line
    return _answer(prepared, metrics, "prepare", time.perf_counter() - started, body)


@v1.post(
    "/budget",
    response_model=BudgetResponse,
    responses=_problems(*COMMON),
    name="budget",
    openapi_extra=documented(PrepareRequest),
)
async def budget(tenant: Tenant, body: PrepareBody, service: Service) -> Response:
    """The budget of what is already materialisable (legacy content, inline blocks); no contributor runs."""
    return json_response(await service.budget(tenant, body))


@v1.get(
    "/preparations/{preparation_id}",
    response_model=PreparationView,
    responses=_problems(401, 404, 503),
    name="get_preparation",
)
async def get_preparation(preparation_id: str, tenant: Tenant, service: Service) -> Response:
    """Manifest, budget, fingerprint and accounting of one preparation (never block bodies)."""
    return json_response(await service.get(tenant, preparation_id))


@v1.post(
    "/preparations/{preparation_id}/validate",
    response_model=ValidateResponse,
    responses=_problems(*COMMON, 404, 409),
    name="validate_preparation",
    openapi_extra=documented(ValidateRequest),
)
async def validate(
    preparation_id: str, tenant: Tenant, body: ValidateBody, service: Service
) -> Response:
    """Final dispatch check: model, scope, prefix, input, expiry and contributor revisions."""
    return json_response(await service.validate(tenant, preparation_id, body))


@v1.post(
    "/preparations/{preparation_id}/refresh",
    response_model=PrepareResponse,
    responses=_problems(*COMMON, 404, 409, 502, 504),
    name="refresh_preparation",
    openapi_extra=documented(PrepareRequest),
)
async def refresh(
    preparation_id: str, tenant: Tenant, body: PrepareBody, service: Service, metrics: MetricsDep
) -> Response:
    """One more contribution and selection round after host hooks edited history or input (once)."""
    started = time.perf_counter()
    try:
        prepared = await service.refresh(tenant, preparation_id, body)
    except Exception as err:
        _failed(err, metrics, "refresh", time.perf_counter() - started, body)
        raise
    return _answer(prepared, metrics, "refresh", time.perf_counter() - started, body)


@v1.post(
    "/preparations/{preparation_id}/repair",
    response_model=RepairResponse,
    responses=_problems(*COMMON, 404, 409),
    name="repair_preparation",
    openapi_extra=documented(RepairRequest),
)
async def repair(
    preparation_id: str, tenant: Tenant, body: RepairBody, service: Service
) -> Response:
    """A structured-output repair frame over the frozen dispatched frame; no contributor is called."""
    return json_response(await service.repair(tenant, preparation_id, body))


@v1.post(
    "/preparations/{preparation_id}/usage",
    response_model=UsageResponse,
    responses=_problems(*COMMON, 404),
    name="report_usage",
    openapi_extra=documented(UsageRequest),
)
async def usage(
    preparation_id: str, tenant: Tenant, body: UsageBody, service: Service, metrics: MetricsDep
) -> Response:
    """Record the provider's usage object; the same ``report_id`` twice changes nothing."""
    recorded = await service.usage(tenant, preparation_id, body)
    last = recorded.response.accounting.last
    if (
        recorded.applied  # a repeated report_id is observed once, by its first call
        and last is not None
        and last.report_id == body.report_id
        and last.input_token_delta is not None
    ):
        metrics.usage_delta.labels(body.provider).observe(last.input_token_delta)
    return json_response(recorded.response)


@v1.get(
    "/preparations/{preparation_id}/breakdown",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/html": {}, "text/plain": {}}}, **_problems(401, 404, 503)},
    name="get_breakdown",
)
async def breakdown(
    preparation_id: str, request: Request, tenant: Tenant, service: Service
) -> Response:
    """Human view: budget bars, decisions with reasons, accounting. HTML for browsers, else text."""
    view = await service.get(tenant, preparation_id)
    vary = {"vary": "Accept"}
    if wants_html(request.headers.get("accept", "")):
        return HTMLResponse(render_html(view), headers=vary)
    return PlainTextResponse(render_text(view), headers=vary)


@v1.get(
    "/preparations/{preparation_id}/timeline",
    response_model=Timeline,
    responses={
        200: {"content": {"text/html": {}, "text/plain": {}}},
        **_problems(401, 404, 503),
    },
    name="get_timeline",
)
async def timeline(
    preparation_id: str, request: Request, tenant: Tenant, service: Service
) -> Response:
    """The preparation and those before it in its scope (up to 50, oldest first): total input,
    prefix kept, first change, expected and reported cached tokens per turn. JSON with
    ``Accept: application/json``, HTML for browsers (with an SVG chart), else text."""
    view = await service.timeline(tenant, preparation_id)
    vary = {"vary": "Accept"}
    accept = request.headers.get("accept", "")
    if wants_json(accept):
        response = json_response(view)
        response.headers.update(vary)
        return response
    if wants_html(accept):
        return HTMLResponse(timeline_html(view), headers=vary)
    return PlainTextResponse(timeline_text(view), headers=vary)


HTML_TYPES = ("text/html", "application/xhtml+xml")


def wants_json(accept: str) -> bool:
    """Whether an ``Accept`` header prefers JSON to HTML and plain text (a tie answers text)."""
    html, text, json = _qualities(accept)
    return json > 0 and json > max(html, text)


def wants_html(accept: str) -> bool:
    """Whether an ``Accept`` header prefers HTML to plain text (RFC 9110 §12.5.1): the highest
    quality wins, ``q=0`` refuses, media types are case-insensitive, and a tie (``*/*`` or
    none) answers plain text, the form a terminal or script reads."""
    html, text, _ = _qualities(accept)
    return html > 0 and html > text


def _qualities(accept: str) -> tuple[float, float, float]:
    """The highest quality an ``Accept`` header gives HTML, plain text and JSON."""
    html = text = json = 0.0
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.lower()
        if media in HTML_TYPES:
            html = max(html, quality)
        elif media in {"text/plain", "text/*"}:
            text = max(text, quality)
        elif media == "application/json":
            json = max(json, quality)
    return html, text, json


class ModelInfo(BaseModel):
    name: str
    provider: str
    context_window: int | None
    max_output_tokens: int | None
    tokenizer: str
    tokens_per_message: int
    tokens_per_name: int
    reply_priming: int
    tokens_per_tool: int
    min_cacheable_prefix: int | None


class ModelList(BaseModel):
    models: list[ModelInfo]
    fallback_context_window: int


@v1.get("/models", response_model=ModelList, name="list_models")
async def models(request: Request) -> ModelList:
    """The capacity registry: window, output limit, tokenizer, framing overhead, cacheable prefix."""
    from context_assembly.core.budget import FALLBACK_CAPACITY

    registry: ModelRegistry = request.app.state.registry
    items = [
        ModelInfo(
            name=p.name,
            provider=p.provider,
            context_window=p.context_window,
            max_output_tokens=p.max_output_tokens,
            tokenizer=p.tokenizer,
            tokens_per_message=p.tokens_per_message,
            tokens_per_name=p.tokens_per_name,
            reply_priming=p.reply_priming,
            tokens_per_tool=p.tokens_per_tool,
            min_cacheable_prefix=p.min_cacheable_prefix,
        )
        for p in registry.all()
    ]
    return ModelList(models=items, fallback_context_window=FALLBACK_CAPACITY)


class ReloadAnswer(BaseModel):
    reloaded: bool
    errors: list[dict[str, str]]


@v1.post(
    "/admin/reload",
    response_model=ReloadAnswer,
    responses=_problems(401, 404, 422),
    name="reload_config",
)
async def reload_config(request: Request) -> ReloadAnswer:
    """Reload the configuration file (keys, contributors, allowlist, limits); admin key required.

    Answers 404 when no admin key is configured or the service runs without a config file; a
    refused reload is 422 CONTEXT_ASSEMBLY_INVALID naming the fields, and changes nothing.
    """
    settings: Settings = request.app.state.settings
    expected = settings.auth.admin_key_sha256
    path = request.app.state.config_path
    if expected is None or path is None:
        raise NotFoundError("no such resource")
    given = request.headers.get("x-admin-key", "")
    if not hmac.compare_digest(hashlib.sha256(given.encode()).hexdigest(), expected.lower()):
        raise UnauthenticatedError("a valid X-Admin-Key is required")
    result = reload_settings(request.app, path)
    if not result.reloaded:
        raise InvalidError(
            "the new configuration was refused; the running one is unchanged", errors=result.errors
        )
    return ReloadAnswer(reloaded=True, errors=[])


class Health(BaseModel):
    status: str


@ops.get("/healthz", response_model=Health, name="healthz")
async def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@ops.get("/readyz", response_model=Health, responses=_problems(503), name="readyz")
async def readyz(service: Service) -> Response | Health:
    """Readiness: the store answers its ping."""
    try:
        await service.store.ping()
    except StoreUnavailableError as err:
        return problem_response(err, "/readyz")
    return Health(status="ready")


@ops.get("/metrics", response_class=PlainTextResponse, name="metrics")
async def metrics_endpoint(metrics: MetricsDep) -> Response:
    """Prometheus metrics of this process."""
    return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
