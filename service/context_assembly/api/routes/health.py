"""``/healthz``, ``/readyz`` and ``/metrics``: liveness, readiness and the Prometheus metrics of
this process (outside ``/v1``, as probes and scrapers expect)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from context_assembly.api.problems import problem_response
from context_assembly.api.routes.dependencies import MetricsDep, Service
from context_assembly.api.routes.problem_answers import problems
from context_assembly.core.request import wire_schema
from context_assembly.errors import StoreUnavailableError

router = APIRouter()


class Health(BaseModel):
    """The process's health."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    status: str = Field(description="`ok` (liveness) or `ready` (readiness).")


@router.get(
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


@router.get(
    "/readyz",
    response_model=Health,
    responses=problems(503),
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


@router.get(
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
