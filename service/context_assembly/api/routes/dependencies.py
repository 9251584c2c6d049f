"""The routes' FastAPI dependencies, as ``Annotated`` aliases: the tenant (authentication), the
service, the metrics and the JSON request bodies (read by ``api/bodies.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from context_assembly.api.auth import Authenticator
from context_assembly.api.bodies import json_body, large_body
from context_assembly.core.request import PrepareRequest
from context_assembly.lifecycle_models import RepairRequest, UsageRequest, ValidateRequest
from context_assembly.metrics import Metrics
from context_assembly.preparations import Preparations


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
