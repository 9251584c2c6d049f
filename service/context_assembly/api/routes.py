"""Thin, typed routes: parse → call ``Preparations`` → return a response model."""

from __future__ import annotations

import hashlib
import hmac
import time
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from context_assembly.api.auth import Authenticator
from context_assembly.api.bodies import documented, json_body, large_body
from context_assembly.api.breakdown import render_html, render_text
from context_assembly.api.middleware import PREPARATION_ID
from context_assembly.api.pages import POLICY
from context_assembly.api.problems import PROBLEM_JSON, problem_response
from context_assembly.api.reload import reload_settings
from context_assembly.api.timeline import render_html as timeline_html
from context_assembly.api.timeline import render_text as timeline_text
from context_assembly.config import Settings
from context_assembly.core import calibration
from context_assembly.core.request import PrepareRequest, wire_schema
from context_assembly.core.result import PrepareResponse
from context_assembly.errors import (
    InvalidError,
    NotFoundError,
    ServiceError,
    StoreUnavailableError,
    UnauthenticatedError,
)
from context_assembly.lifecycle_models import (
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
from context_assembly.tokens.prices import ModelPrices, RegisteredPrice
from context_assembly.tokens.registry import ModelRegistry


class Problem(BaseModel):
    """An RFC 9457 problem (`application/problem+json`), with the field or source it is about
    where there is one: `field`, `sources`, `block_ids`, `reasons`, `errors`, `candidates`."""

    model_config = ConfigDict(extra="allow", json_schema_extra=wire_schema)
    type: str = Field(
        description="`urn:context-assembly:problem:` and the code in lower case with hyphens: a "
        "name for the kind of problem, not an address to fetch."
    )
    title: str = Field(description="A short summary of the kind of problem.")
    status: int = Field(description="The HTTP status.")
    detail: str = Field(description="What went wrong with this request.")
    code: str = Field(
        description="The error code (`CONTEXT_ASSEMBLY_INVALID`, `NOT_FOUND`, ...); the clients "
        "raise one error class per code."
    )
    instance: str | None = Field(default=None, description="The path of the request.")


# What each error status means, in the words of the error table (docs/api.md).
PROBLEMS: dict[int, str] = {
    401: "`UNAUTHENTICATED`: no key, or an unknown one.",
    404: "`NOT_FOUND`: an unknown id, an expired one, or another tenant's.",
    409: "`CONTEXT_ASSEMBLY_STALE`: the preparation no longer holds; `reasons` lists why.",
    413: "`PAYLOAD_TOO_LARGE`: a body over `[limits] max_body_bytes`.",
    422: "`CONTEXT_ASSEMBLY_INVALID`: a malformed request or body; `field` names the field.",
    502: "`CONTRIBUTOR_FAILED`: a contributor with failure policy `fail` failed; the body names "
    "the source and the cause.",
    503: "`STORE_UNAVAILABLE`: the store did not answer in time; retry later.",
    504: "`CONTEXT_ASSEMBLY_TIMEOUT`: a contributor with failure policy `fail` did not answer "
    "within the deadline.",
}
# The GET routes read their parameters as FastAPI does, which lists a 422 for them.
PARAMETER_422 = "`CONTEXT_ASSEMBLY_INVALID`: a malformed parameter; `field` names it."
ASSEMBLY_422 = (
    "`CONTEXT_ASSEMBLY_INVALID`: a malformed request or block, a duplicate, a dependency cycle, "
    "a missing or expired protected dependency, an unknown source or endpoint (`field` names "
    "it). `CONTEXT_ASSEMBLY_OVERFLOW`: the protected blocks and their dependencies exceed "
    "`max_data_tokens` or a source limit. `CONTEXT_OVERFLOW`: the frame cannot fit the window. "
    "`CONTRIBUTOR_URL_REJECTED`: an inline URL outside the allowlist."
)


def _problems(*statuses: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route: problem+json, each described (``described`` overrides a
    status's description, keyed ``s422``)."""
    return {
        status: {
            "model": Problem,
            "description": described.get(f"s{status}", PROBLEMS[status]),
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


def _body(model: type[BaseModel], examples: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route whose body is ``model``, with its OpenAPI ``examples``:
    Swagger UI's "Try it out" starts from the first, ReDoc lists them all."""
    extra = documented(model)
    extra["requestBody"]["content"]["application/json"]["examples"] = examples
    return extra


# --------------------------------------------------------------------------- request examples
# Each one is a request the service answers 200 (tests/api/test_openapi_teaches.py posts them):
# the prepare examples with the default configuration, except the contributor one, which needs
# the registration it names. The validate and repair examples hold the frame the minimal prepare
# example answers (its date line aside, outside the prefix and the input), so that they hold for
# any preparation made with it. Their names sort in the order given, so that the first (the one
# Swagger UI fills in) is the same in the committed document (sorted keys) and the served one.

_INSTRUCTIONS = "You are a careful operations assistant."
_QUESTION = {"role": "user", "content": "Is order A42 paid?"}
_FRAME = {
    "messages": [
        {"role": "system", "content": _INSTRUCTIONS},
        {
            "role": "developer",
            "content": "Current date and time: 2026-12-02 12:00 (UTC, Wednesday)",
        },
        _QUESTION,
    ],
    "tools": [],
}

PREPARE_EXAMPLES: dict[str, dict[str, Any]] = {
    "minimal": {
        "summary": "Minimal: a model, instructions and the user's turn",
        "description": "No sources: the frame is the instructions, the date line and the input. "
        "`stable-prefix` keeps the instructions in a prefix that stays the same from turn to "
        "turn (the date line follows it).",
        "value": {
            "model": "gpt-4o-mini",
            "instructions": _INSTRUCTIONS,
            "input": [_QUESTION],
            "assembly": {"layout": "stable-prefix"},
        },
    },
    "with_blocks_and_whiteboard": {
        "summary": "Inline blocks and a whiteboard under a data limit",
        "description": "Each source replaces a plugin's content view. `receipt` is protected, "
        "`policy` needs `orders/glossary` and has a projection for when it does not fit, "
        "`faq` has expired; whiteboard entries become blocks (`critical` is protected). "
        "`selection.blocks` says what was chosen and why.",
        "value": {
            "model": "gpt-4o-mini",
            "response_reserve": 512,
            "assembly": {
                "max_data_tokens": 300,
                "source_token_limits": {"orders": 200},
                "layout": "stable-prefix",
            },
            "instructions": _INSTRUCTIONS,
            "plugins": [
                {"name": "orders", "instructions": "Order records; cite their ids."},
                {"name": "memory", "instructions": "Saved entries; read one with store_get."},
            ],
            "contributions": [
                {
                    "source": "orders",
                    "revision": "2026-12-02T11:58:00Z",
                    "blocks": [
                        {"id": "receipt", "text": "Receipt A42: paid 40 EUR.", "protected": True},
                        {"id": "glossary", "text": "A receipt proves a completed payment."},
                        {
                            "id": "policy",
                            "text": "Refunds: within 30 days, to the original card, "
                            "after the item is back in the warehouse and checked.",
                            "priority": 10,
                            "dependencies": ["orders/glossary"],
                            "projection": "Refunds within 30 days.",
                        },
                        {
                            "id": "faq",
                            "text": "Old FAQ about paper receipts.",
                            "expires_at": "2026-01-01T00:00:00Z",
                        },
                    ],
                }
            ],
            "whiteboard": {
                "source": "memory",
                "recovery_tool": "store_get",
                "entries": [
                    {
                        "key": "customer",
                        "description": "The customer's identity",
                        "value": {"id": "C7", "name": "Ada"},
                        "priority": "critical",
                    },
                    {
                        "key": "mood",
                        "description": "Tone so far",
                        "value": "calm",
                        "priority": "low",
                    },
                ],
            },
            "input": [_QUESTION],
        },
    },
    "with_cache": {
        "summary": "Provider cache plan (Anthropic)",
        "description": "`render: anthropic` answers the Messages API body; with `cache` it carries "
        "`cache_control` markers where the prefix reaches the model's minimum cacheable length "
        "(`selection.cache.skipped` says why one is not placed) and compares this turn with the "
        "previous one of the same scope.",
        "value": {
            "model": "claude-sonnet-4-5",
            "render": "anthropic",
            "response_reserve": 1024,
            "cache": {"breakpoints": True, "ttl": "5m"},
            "assembly": {"layout": "stable-prefix"},
            "instructions": _INSTRUCTIONS,
            "tools": [
                {
                    "name": "order_status",
                    "description": "Look an order up by id.",
                    "parameters": {
                        "type": "object",
                        "properties": {"order_id": {"type": "string"}},
                        "required": ["order_id"],
                    },
                }
            ],
            "scope": {"account_id": "acme", "task_id": "order-A42"},
            "history": [
                {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Hello! How can I help?"},
            ],
            "input": [_QUESTION],
        },
    },
    "with_contributor": {
        "summary": "A registered contributor (webhook)",
        "description": "The service calls the contributor registered as `[contributors.memory]` "
        "in its configuration, within `timeout_ms`; its blocks replace the `memory` plugin's "
        "view. Without that registration the answer is a `422` naming `contributors.0.endpoint`.",
        "value": {
            "model": "gpt-4o-mini",
            "instructions": _INSTRUCTIONS,
            "plugins": [{"name": "memory", "instructions": "Facts saved in earlier turns."}],
            "contributors": [{"source": "memory", "endpoint": "memory", "failure_policy": "omit"}],
            "assembly": {"layout": "stable-prefix", "timeout_ms": 800},
            "scope": {"account_id": "acme", "task_id": "order-A42"},
            "input": [_QUESTION],
        },
    },
    "with_routing": {
        "summary": "Routing: the first candidate model that fits",
        "description": "`models` instead of `model`: the first candidate whose window holds the "
        "request is chosen; `selection.routing` reports each candidate tried.",
        "value": {
            "models": ["gpt-4", "gpt-4o-mini"],
            "routing": {"policy": "first_fit"},
            "instructions": _INSTRUCTIONS,
            "input": [_QUESTION],
            "assembly": {"layout": "stable-prefix"},
        },
    },
}

VALIDATE_EXAMPLES: dict[str, dict[str, Any]] = {
    "frame": {
        "summary": "The frame about to be sent",
        "description": "The frame of the minimal prepare example, as its answer gave it.",
        "value": {"model": "gpt-4o-mini", "frame": _FRAME},
    }
}

REPAIR_EXAMPLES: dict[str, dict[str, Any]] = {
    "schema": {
        "summary": "Ask for the answer as JSON matching a schema",
        "description": "The dispatched frame of the minimal prepare example and the model's "
        "answer; `instructions` are the prepare request's.",
        "value": {
            "model": "gpt-4o-mini",
            "instructions": _INSTRUCTIONS,
            "frame": _FRAME,
            "answer": "Yes, order A42 is paid: 40 EUR.",
            "schema": {
                "type": "object",
                "properties": {"paid": {"type": "boolean"}, "amount_eur": {"type": "number"}},
                "required": ["paid"],
            },
        },
    }
}

USAGE_EXAMPLES: dict[str, dict[str, Any]] = {
    "chat_completions": {
        "summary": "OpenAI Chat Completions usage",
        "description": "The `usage` object of the completion, as received.",
        "value": {
            "report_id": "chatcmpl-A42",
            "provider": "openai",
            "call": "main",
            "usage": {
                "prompt_tokens": 37,
                "completion_tokens": 12,
                "total_tokens": 49,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
    },
    "messages": {
        "summary": "Anthropic Messages usage",
        "description": "The `usage` object of the message, as received (for a preparation "
        "made for an Anthropic model).",
        "value": {
            "report_id": "msg_A42",
            "provider": "anthropic",
            "usage": {
                "input_tokens": 30,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "output_tokens": 12,
            },
        },
    },
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
LargeBody = Annotated[bool, Depends(large_body)]  # after the body: it reads the bytes kept
# The body models, in the order the routes take them (``app._complete_openapi`` documents them).
BODY_MODELS = (PrepareRequest, ValidateRequest, RepairRequest, UsageRequest)

v1 = APIRouter(prefix="/v1")
ops = APIRouter()
COMMON = (401, 413, 422, 503)


@v1.post(
    "/prepare",
    response_model=PrepareResponse,
    responses=_problems(*COMMON, 502, 504, s422=ASSEMBLY_422),
    name="prepare",
    tags=["Prepare"],
    summary="Prepare a model call",
    response_description="The frame to send, the budget, the manifest (`selection`) and the "
    "hashes; the preparation is stored under `preparation_id`.",
    openapi_extra=_body(PrepareRequest, PREPARE_EXAMPLES),
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
        _failed(err, metrics, "prepare", time.perf_counter() - started, body)
        raise
    request.scope[PREPARATION_ID] = prepared.response.preparation_id  # for the access line
    return _answer(prepared, metrics, "prepare", time.perf_counter() - started, body)


@v1.post(
    "/budget",
    response_model=BudgetResponse,
    responses=_problems(*COMMON, s422=ASSEMBLY_422),
    name="budget",
    tags=["Prepare"],
    summary="Count and select without calling anyone",
    response_description="The budget and manifest of what is materialisable, and the webhook "
    "sources left pending.",
    openapi_extra=_body(PrepareRequest, PREPARE_EXAMPLES),
)
async def budget(tenant: Tenant, body: PrepareBody, large: LargeBody, service: Service) -> Response:
    """The same body as prepare, but only what is already materialisable (inline
    contributions, the whiteboard, legacy views) is counted and selected: no contributor is
    called and nothing is stored."""
    return json_response(await service.budget(tenant, body, large_body=large))


@v1.get(
    "/preparations/{preparation_id}",
    response_model=PreparationView,
    responses=_problems(401, 404, 422, 503, s422=PARAMETER_422),
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


@v1.post(
    "/preparations/{preparation_id}/validate",
    response_model=ValidateResponse,
    responses=_problems(
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
    openapi_extra=_body(ValidateRequest, VALIDATE_EXAMPLES),
)
async def validate(
    preparation_id: str, tenant: Tenant, body: ValidateBody, service: Service
) -> Response:
    """The final check right before dispatch, with the `model` and the `frame` about to be sent
    (and optionally the `scope`): the prefix, the input and the expiry of the entered blocks
    are compared with the record, and each contributor is asked for its current revision."""
    return json_response(await service.validate(tenant, preparation_id, body))


@v1.post(
    "/preparations/{preparation_id}/refresh",
    response_model=PrepareResponse,
    responses=_problems(
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
    openapi_extra=_body(PrepareRequest, PREPARE_EXAMPLES),
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
        _failed(err, metrics, "refresh", time.perf_counter() - started, body)
        raise
    return _answer(prepared, metrics, "refresh", time.perf_counter() - started, body)


@v1.post(
    "/preparations/{preparation_id}/repair",
    response_model=RepairResponse,
    responses=_problems(*COMMON, 404, 409),
    name="repair_preparation",
    tags=["Lifecycle"],
    summary="Frame a structured-output repair call",
    response_description="The repair call's frame and its estimated input tokens.",
    openapi_extra=_body(RepairRequest, REPAIR_EXAMPLES),
)
async def repair(
    preparation_id: str, tenant: Tenant, body: RepairBody, service: Service
) -> Response:
    """A frame for a repair call after the model answered: the dispatched frame, the answer and
    a user message asking for the answer as JSON (matching `schema` if given). It checks
    staleness like validate and calls no contributor."""
    return json_response(await service.repair(tenant, preparation_id, body))


@v1.post(
    "/preparations/{preparation_id}/usage",
    response_model=UsageResponse,
    responses=_problems(*COMMON, 404),
    name="report_usage",
    tags=["Lifecycle"],
    summary="Report the provider's usage",
    response_description="The accounting: the estimate beside the normalised reports.",
    openapi_extra=_body(UsageRequest, USAGE_EXAMPLES),
)
async def usage(
    preparation_id: str, tenant: Tenant, body: UsageBody, service: Service, metrics: MetricsDep
) -> Response:
    """The provider's usage object for a call made with this preparation. The service
    normalises it (input, cached, cache-creation and output tokens) and keeps the difference
    from its estimate. The same `report_id` twice changes nothing; an expired preparation is
    never recreated."""
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
    responses={
        200: {"content": {"text/html": {}, "text/plain": {}}},
        **_problems(401, 404, 422, 503, s422=PARAMETER_422),
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


@v1.get(
    "/preparations/{preparation_id}/timeline",
    response_model=Timeline,
    responses={
        200: {"content": {"text/html": {}, "text/plain": {}}},
        **_problems(401, 404, 422, 503, s422=PARAMETER_422),
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


HTML_TYPES = ("text/html", "application/xhtml+xml")
# The headers of the HTML pages (``pages.POLICY``).
PAGE_HEADERS = {"content-security-policy": POLICY}


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


class ModelCalibration(BaseModel):
    """How the provider's counts in the tenant's usage reports have calibrated the estimate."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    reports: int = Field(description="How many usage reports' ratios are kept (at most 50).")
    factor: float | None = Field(
        description="The factor estimated counts are multiplied by (between 0.5 and 1; `null` "
        "while fewer than 5 reports are kept)."
    )


class ModelPriceTier(BaseModel):
    """The rates of a whole request whose input exceeds `above_input_tokens` (the provider's
    long-context price), in USD per million tokens."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    above_input_tokens: int = Field(
        description="The input size above which the whole request takes these rates, in tokens "
        "(cache reads and writes included)."
    )
    input: float = Field(description="Uncached input, USD per million tokens.")
    output: float = Field(description="Output (reasoning included), USD per million tokens.")
    cache_read: float | None = Field(
        description="Input read from the prompt cache, USD per million tokens (`null`: not "
        "published at this size)."
    )
    cache_write: float | None = Field(
        description="Input written to the prompt cache at the single write rate, USD per million "
        "tokens (`null`: not published at this size)."
    )
    cache_write_5m: float | None = Field(
        description="Input written to the cache for 5 minutes, USD per million tokens (`null`: "
        "not published at this size)."
    )
    cache_write_1h: float | None = Field(
        description="Input written to the cache for 1 hour, USD per million tokens (`null`: not "
        "published at this size)."
    )


class ModelPrice(BaseModel):
    """A model's price, in USD per million tokens at the provider's standard tier. A rate that is
    `null` is one the provider publishes no price for: a usage report with tokens at it has no
    cost, never one at another rate."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    source: Literal["shipped", "configured"] = Field(
        description="`shipped`: the prices of the service's release. `configured`: a "
        '`[prices."name"]` table of the configuration, which adds this price or replaces the '
        "shipped one."
    )
    read_from: str | None = Field(
        description="The page the prices were read from (`null`: a configured price that names "
        "none)."
    )
    checked: str | None = Field(
        description="The date (YYYY-MM-DD) the prices were read (`null`: a configured price that "
        "names none)."
    )
    input: float = Field(description="Uncached input, USD per million tokens.")
    output: float = Field(description="Output (reasoning included), USD per million tokens.")
    cache_read: float | None = Field(
        description="Input read from the prompt cache (cache hits), USD per million tokens."
    )
    cache_write: float | None = Field(
        description="Input written to the prompt cache at the model's single write rate (OpenAI "
        "GPT-5.6 and later), USD per million tokens; `null` for earlier OpenAI models, whose "
        "writes are not billed apart."
    )
    cache_write_5m: float | None = Field(
        description="Input written to the cache for 5 minutes (Anthropic), USD per million tokens."
    )
    cache_write_1h: float | None = Field(
        description="Input written to the cache for 1 hour (Anthropic), USD per million tokens."
    )
    cache_storage_per_hour: float | None = Field(
        description="Storage of an explicit context cache (Gemini), USD per million tokens per "
        "hour; not part of a call's cost."
    )
    long_context: ModelPriceTier | None = Field(
        description="The rates of a request whose input exceeds a size (`null`: the same rates at "
        "every size)."
    )


class ModelInfo(BaseModel):
    """One model of the registry. A request's model resolves to the entry of that name or alias,
    or of which it is a dated snapshot (`-2025-08-07`, `-20250929`, `@20250929`, `-latest`);
    any other name is unknown."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    name: str = Field(description="The model's name.")
    aliases: list[str] = Field(description="Other names that resolve to this entry.")
    source: Literal["shipped", "configured"] = Field(
        description="`shipped`: the registry of the service's release. `configured`: a "
        '`[models."name"]` table of the configuration, which adds this entry or replaces the '
        "shipped one of the same name."
    )
    read_from: str | None = Field(
        description="The page the figures were read from (`null`: a configured entry that "
        "names none)."
    )
    checked: str | None = Field(
        description="The date (YYYY-MM-DD) the figures were read (`null`: a configured entry "
        "that names none)."
    )
    provider: str = Field(description="Its provider.")
    context_window: int | None = Field(description="Its context window, in tokens.")
    max_output_tokens: int | None = Field(description="The most tokens it may answer.")
    tokenizer: str = Field(
        description="`o200k_base`, `cl100k_base`, or `estimate` (no public tokenizer: counts are "
        "conservative and not exact)."
    )
    estimate_scale: float = Field(
        description="The factor on the conservative estimate (1 unless the model's tokenizer "
        "counts more than the estimator allows for); it also scales the framing tokens."
    )
    tokens_per_message: int = Field(description="The framing tokens of each message.")
    tokens_per_name: int = Field(description="The tokens a message's `name` adds.")
    reply_priming: int = Field(description="The tokens that prime the reply, once per request.")
    tokens_per_tool: int = Field(description="The framing tokens of each tool definition.")
    min_cacheable_prefix: int | None = Field(
        description="The shortest prefix the provider caches, in tokens (`null`: unknown or none)."
    )
    price: ModelPrice | None = Field(
        description="Its price and where it comes from (`null`: no price is known, and its usage "
        "reports have no cost)."
    )
    calibration: ModelCalibration | None = Field(
        default=None,
        description="The estimate's calibration for the caller's tenant (absent for exact "
        "tokenizers, and without a valid key when keys are required).",
    )


class ModelList(BaseModel):
    """The model registry."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    models: list[ModelInfo] = Field(description="Every model the registry knows.")
    fallback_context_window: int = Field(
        description="The window of a model the registry does not know, without "
        "`max_context_tokens`."
    )


@v1.get(
    "/models",
    response_model=ModelList,
    name="list_models",
    tags=["Models"],
    summary="List the model registry",
    response_description="Every known model's window, output limit, tokenizer, framing and "
    "minimum cacheable prefix.",
)
async def models(request: Request) -> ModelList:
    """The model registry: context window, output limit, tokenizer, framing overhead and
    minimum cacheable prefix where known, and where each entry comes from (shipped, or a
    `[models."name"]` table of the configuration). Needs no key."""
    from context_assembly.core.budget import FALLBACK_CAPACITY

    registry: ModelRegistry = request.app.state.registry
    prices: ModelPrices = request.app.state.prices
    kept = await _calibrations(request)
    items = [
        ModelInfo(
            name=p.name,
            aliases=list(item.entry.aliases),
            source=item.origin,
            read_from=item.entry.source,
            checked=item.entry.checked,
            provider=p.provider,
            context_window=p.context_window,
            max_output_tokens=p.max_output_tokens,
            tokenizer=p.tokenizer,
            estimate_scale=p.estimate_scale,
            tokens_per_message=p.tokens_per_message,
            tokens_per_name=p.tokens_per_name,
            reply_priming=p.reply_priming,
            tokens_per_tool=p.tokens_per_tool,
            min_cacheable_prefix=p.min_cacheable_prefix,
            price=_model_price(prices.for_entry(p.name)),
            calibration=None
            if kept is None or p.tokenizer != "estimate"
            else ModelCalibration(
                reports=len(kept.get(p.name, ())), factor=calibration.factor(kept.get(p.name, ()))
            ),
        )
        for item in registry.entries()
        for p in (item.profile,)
    ]
    return ModelList(models=items, fallback_context_window=FALLBACK_CAPACITY)


def _usd(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _model_price(found: RegisteredPrice | None) -> ModelPrice | None:
    """The wire form of a registry entry's price."""
    if found is None:
        return None
    entry, tier = found.entry, found.entry.long_context
    return ModelPrice(
        source=found.origin,
        read_from=entry.source,
        checked=entry.checked,
        input=float(entry.input),
        output=float(entry.output),
        cache_read=_usd(entry.cache_read),
        cache_write=_usd(entry.cache_write),
        cache_write_5m=_usd(entry.cache_write_5m),
        cache_write_1h=_usd(entry.cache_write_1h),
        cache_storage_per_hour=_usd(entry.cache_storage_per_hour),
        long_context=None
        if tier is None
        else ModelPriceTier(
            above_input_tokens=tier.above_input_tokens,
            input=float(tier.input),
            output=float(tier.output),
            cache_read=_usd(tier.cache_read),
            cache_write=_usd(tier.cache_write),
            cache_write_5m=_usd(tier.cache_write_5m),
            cache_write_1h=_usd(tier.cache_write_1h),
        ),
    )


async def _calibrations(request: Request) -> dict[str, list[float]] | None:
    """The caller's tenant's calibration ratios by model; ``None`` without a valid key where
    keys are required (the registry itself needs none)."""
    try:
        tenant = await get_tenant(request)
    except UnauthenticatedError:
        return None
    service: Preparations = request.app.state.preparations
    return await service.store.calibrations(tenant)


class ReloadAnswer(BaseModel):
    """The configuration file was reloaded."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    reloaded: bool = Field(description="Always `true` (a refused reload is `422`).")
    errors: list[dict[str, str]] = Field(description="Always empty.")


@v1.post(
    "/admin/reload",
    response_model=ReloadAnswer,
    responses=_problems(
        401,
        404,
        422,
        s401="`UNAUTHENTICATED`: a valid `X-Admin-Key` is required.",
        s404="`NOT_FOUND`: no admin key is configured, or the service runs without a "
        "configuration file.",
        s422="`CONTEXT_ASSEMBLY_INVALID`: the new configuration was refused and the running one "
        "is unchanged; `errors` names the fields.",
    ),
    name="reload_config",
    tags=["Operations"],
    summary="Reload the configuration file",
    response_description="The new configuration is in force.",
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
    """The process's health."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    status: str = Field(description="`ok` (liveness) or `ready` (readiness).")


@ops.get(
    "/healthz",
    response_model=Health,
    name="healthz",
    tags=["Operations"],
    summary="Liveness",
    response_description="The process answers.",
)
async def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@ops.get(
    "/readyz",
    response_model=Health,
    responses=_problems(503),
    name="readyz",
    tags=["Operations"],
    summary="Readiness",
    response_description="The store answers.",
)
async def readyz(service: Service) -> Response | Health:
    """Readiness: the store answers its ping."""
    try:
        await service.store.ping()
    except StoreUnavailableError as err:
        return problem_response(err, "/readyz")
    return Health(status="ready")


@ops.get(
    "/metrics",
    response_class=PlainTextResponse,
    name="metrics",
    tags=["Operations"],
    summary="Prometheus metrics",
    response_description="The metrics of this process, in the Prometheus text format.",
)
async def metrics_endpoint(metrics: MetricsDep) -> Response:
    """Prometheus metrics of this process."""
    return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
